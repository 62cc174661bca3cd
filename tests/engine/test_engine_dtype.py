"""The embedded engine's dtype follows the CPU (engine/server.cpu_dtype): bfloat16 where the CPU computes it,
float32 where it would be emulated, vLLM's default where the flags cannot be read."""

from __future__ import annotations

from pathlib import Path

from orchestrator.engine.server import BLOCK_SIZE, _server_command, cpu_dtype

AVX2 = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n"
BF16 = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 avx512f avx512_bf16\n"
AMX = "flags\t\t: avx2 avx512f amx_bf16 amx_tile\n"


def test_the_dtype_follows_the_cpu_flags():
    assert cpu_dtype(AVX2) == "float32"
    assert cpu_dtype(BF16) == "bfloat16" and cpu_dtype(AMX) == "bfloat16"
    assert cpu_dtype("processor\t: 0\n") is None and cpu_dtype("") is None


def test_the_server_is_started_with_it(tmp_path):
    cmd = _server_command(tmp_path / "python", tmp_path / "model", 8123)
    dtype = cpu_dtype()
    assert ("--dtype" in cmd) == (dtype is not None)
    if dtype is not None:
        assert cmd[cmd.index("--dtype") + 1] == dtype


def test_the_kv_block_is_small_enough_for_a_small_prompt_to_fill_one():
    # the prefix cache keeps whole blocks; vLLM's CPU default of 128 tokens is longer than the small profile's
    # whole section request, so the outline context never hit it
    cmd = _server_command(Path("python"), Path("model"), 8123)
    assert cmd[cmd.index("--block-size") + 1] == str(BLOCK_SIZE) and BLOCK_SIZE % 32 == 0 and BLOCK_SIZE < 100
    assert "--block-size" not in _server_command(Path("python"), Path("model"), 8123, block_size=None)
