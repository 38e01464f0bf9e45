"""The DBNet configurations timed on the CPU by compare.py (against PyTorch) and layouts.py
(NCHW against channels-last): name, width, inner, image size, batch."""
CONFIGS = [
    ("width16-inner64-256px", 16, 64, 256, 8),
    ("width64-inner256-256px", 64, 256, 256, 4),
]
