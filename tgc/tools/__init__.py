"""Command-line tools: tgc-opt, tgc-run, tgc-translate."""
