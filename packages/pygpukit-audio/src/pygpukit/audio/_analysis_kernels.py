"""Launch helpers of the analysis kernels (native/kernels/audio/analysis.cu): YIN, second-order IIR sections,
the onset-strength flux and the frame gate, used by pitch.py, onset.py and dynamics.py."""

from __future__ import annotations

from typing import Any

from pygpukit.core.dtypes import DType
from pygpukit.core.jit import Param

from . import _kernels as kern

__all__ = ["launch"]

_P = kern.pointer


def _i(name: str) -> Param:
    return kern.c_param(name, "int")


def _q(name: str) -> Param:
    return kern.c_param(name, "long long")


def _d(name: str) -> Param:
    return kern.c_param(name, "double")


PARAMS: dict[str, tuple[Param, ...]] = {
    "yin_frames": (_P("frames"), _P("work"), _P("f0"), _q("n"), _i("frame_length"), _i("min_period"),
                   _i("max_period"), _d("threshold"), _d("sr"), _d("tiny")),
    "sos_filter": (_P("x"), _P("out"), _P("sos"), _q("rows"), _q("length"), _i("n_sections")),
    "onset_flux": (_P("S"), _P("out"), _q("rows"), _i("n_freq"), _q("n_frames"), _i("lag"), _i("max_size"),
                   _q("pad"), _i("aggregate")),
    "frame_gate": (_P("x"), _P("level"), _P("out"), _q("rows"), _q("length"), _q("n_frames"), _i("hop"),
                   _d("threshold"), _d("floor_gain")),
    "viterbi": (_P("log_prob"), _P("log_trans"), _P("value"), _P("ptr"), _P("states"), _q("rows"), _q("n_frames"),
                _i("n_states"), _d("log_init")),
}  # fmt: skip


def launch(name: str, dtype: DType, work: int, *args: Any, block: int = kern.BLOCK, grid: int | None = None) -> None:
    """A grid-stride launch of ``name`` over ``work`` items (one a thread unless ``grid`` is given)."""
    blocks = grid if grid is not None else kern.grid_for(work, block)
    kern.kernel(name, dtype, PARAMS[name])(*args, grid=blocks, block=block)
