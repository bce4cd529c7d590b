"""Engine schemas: the command line and environment of pinned engine releases, extracted statically.

``vllm``      vLLM ``vllm serve`` flags (EngineArgs/AsyncEngineArgs, FrontendArgs, make_arg_parser) and the
              variables of ``vllm/envs.py`` and the rest of the package, read with :mod:`ast`/regex only
``ranges``    the value ranges a release's source states (pydantic ``Field`` bounds, unconditional checks)
``refresh``   ``pip download --no-deps`` the pinned wheels (or the pinned sdist of a release the index has
              no wheel of), extract, write the committed JSON schemas and ``ranges.json``

SGLang's schema comes from :mod:`atlasctl.engine_schema.sglang` (same document shape).
"""
