"""Engine schemas: the command line and environment of pinned engine releases, extracted statically.

``vllm``      vLLM ``vllm serve`` flags (EngineArgs/AsyncEngineArgs, FrontendArgs, make_arg_parser) and the
              variables of ``vllm/envs.py`` and the rest of the package, read with :mod:`ast`/regex only
``refresh``   ``pip download --no-deps`` the pinned wheels, extract, write the committed JSON schemas

SGLang's schema comes from :mod:`atlasctl.engine_schema.sglang` (same document shape).
"""
