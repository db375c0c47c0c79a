"""The command line (diffusion-infill) and the commands that fetch and convert weights."""
