"""Capra, the GA-2 compiler: graph -> scales -> buffers -> 128-bit program, image and readback.

Pure Python; imports only `hdl.isa`, `hdl.arith` and `hdl.config` (the chip compiled for). A backend (any object with
``run(code, image, lat)``) is passed to `run`, never imported here.
"""
from .buffers import Allocator, Buffer, ExtEntry
from .emit import Program, compile_graph
from .graph import CompileError, Graph, Node, evaluate_float
from .image import ext_image, readback, run
from .interp import interpret, interpret_all, interpret_readback, stage_check

__all__ = ["Graph", "Node", "CompileError", "evaluate_float", "compile_graph", "Program", "ext_image",
           "readback", "run", "interpret", "interpret_all", "interpret_readback", "stage_check", "Allocator", "Buffer", "ExtEntry"]
