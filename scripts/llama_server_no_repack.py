"""llama-cpp-python's OpenAI server without llama.cpp's extra weight buffers (its CLI's `--no-repack`).

llama.cpp moves quantized weights into "extra" CPU buffer types when it loads them: repacked layouts, and on
CPUs that report AMX, AMX tiles. On a 2-core Xeon VM that reports AMX (2026-12-03), llama-cpp-python 0.3.36
crashed (SIGSEGV) that way on any Q4_1 prompt of a few tokens ("Hi" passed, "Hello, my name is" did not),
while the F32 GGUF (no extra buffers) ran. For Q4_1 the only extra buffer there is AMX's (ggml's repack.cpp has
no Q4_1 layout), so the crash is in llama.cpp's AMX kernels, and without extra buffers Q4_1 runs on its
AVX-512 kernels.
llama.cpp's own server has `--no-repack` for this (llama_model_params.use_extra_bufts = false), llama-cpp-python
does not expose it, so this wrapper sets it and starts the stock server with the arguments given:

    $LLAMA_VENV/bin/python scripts/llama_server_no_repack.py --model M.gguf --port 8000 ...

`scripts/serve_sweep.sh` uses it only when the stock library crashes on a probe prompt with the Q4_1 file.
Run with llama-cpp-python's own interpreter (it imports nothing of blockdraft).
"""
import llama_cpp.llama_cpp as lib
from llama_cpp.server.__main__ import main

_defaults = lib.llama_model_default_params


def _without_extra_buffers():
    params = _defaults()
    params.use_extra_bufts = False
    return params


lib.llama_model_default_params = _without_extra_buffers  # llama_cpp.Llama reads its defaults through this name

if __name__ == "__main__":
    main()
