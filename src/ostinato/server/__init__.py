"""llama-server as the artifact drives it: start and stop it (`launcher`), and stream completions from it (`client`).

Shared by the replay, the sweep, the calibration and the memory check, so none of them depends on another.
"""

from ostinato.server.client import RequestInput, RequestOutput, consume_stream, erase_slot, send_completion
from ostinato.server.launcher import ExternalServer, LlamaServer, ServerConfig, ServerError, free_port

__all__ = ["RequestInput", "RequestOutput", "consume_stream", "erase_slot", "send_completion", "ExternalServer",
           "LlamaServer", "ServerConfig", "ServerError", "free_port"]
