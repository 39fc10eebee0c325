"""The artifact's own documents and verdict: `ARTIFACT.md` and the reference READMEs rendered from their data
(`docs`, with the computations in `facts`); the claims' checks (`checks`, read from their files by `readers`),
their verdict on a run and the shipped data (`verdict`, written by `verdict_table`); the local-agent check
(`agent`)."""
