"""The artifact's own documents and verdict: `ARTIFACT.md` and the reference READMEs rendered from their data
(`docs`, with the computations in `facts`)."""
