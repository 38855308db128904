"""The report stage's library: its settings (settings), the paper's tables beside ours (tables), the figures
and plot data (figures), and what tables and figures share (common). Nothing is imported here, so that
gcl.config can read the report's settings without loading pandas and matplotlib."""
