"""torch.compile as the PyTorch reference scripts (bench/vit/torch_reference.py,
bench/dbnet/torch_reference.py) time it: the `--compile [MODE]` option, the model compiled in
that mode, and the mark each training step starts with.

reduce-overhead and max-autotune replay the compiled model's kernels as CUDA graphs: torch's
counterpart of precis's captured step (train_options::graph). max-autotune also searches
kernel configurations while compiling, which takes minutes on a large model.
"""
import torch

MODES = ("default", "reduce-overhead", "max-autotune")


def add_option(ap):
    """Adds --compile [MODE] to an argparse parser: None without it, "default" alone."""
    ap.add_argument("--compile", nargs="?", const="default", default=None, choices=MODES, metavar="MODE",
                    help="time: torch.compile the model, in MODE (default, reduce-overhead or max-autotune; "
                         "default when no MODE is given)")


def compiled(model, mode):
    """The model under torch.compile in `mode`, or the model itself where mode is None."""
    if mode is None:
        return model
    return torch.compile(model, mode=None if mode == "default" else mode)


def begin_step(mode):
    """Marks a new training step for the modes that use CUDA graphs, so that torch does not take
    this step's outputs for the previous step's, still in use."""
    if mode in ("reduce-overhead", "max-autotune") and hasattr(torch.compiler, "cudagraph_mark_step_begin"):
        torch.compiler.cudagraph_mark_step_begin()
