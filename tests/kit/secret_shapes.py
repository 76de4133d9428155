"""A generated corpus of the shapes a credential takes in the text vLLM (and what it runs) prints (issue 20).

`secret_texts` draws (text, secrets): a line as vLLM, Python, the hub client or a shell would print it, carrying one or
more secret values in one of the shapes the redactor must mask — every value after a secret-bearing name (lists and
tuples included), URL userinfo, `*_SECRET*`/`*_KEY*`/`*_TOKEN*` assignments, `Authorization:` values with or without
a scheme, `invalid token X`, free-form `--api-key` values — inside the lines the classifier recognises and the ones
it does not. Each secret carries a marker (`Zq`) no vLLM text contains, so a leak is found by a plain substring test.
"""

from __future__ import annotations

import string

from hypothesis import strategies as st

__all__ = ["MARK", "secret_texts", "secret_value"]

#: Every generated secret contains this; no vLLM message or operator text does.
MARK = "Zq"

_BARE = string.ascii_letters + string.digits + "-_./+=~!$%^&:;?#@|`"
_QUOTED = _BARE + " "

secret_value = st.builds(lambda head, tail: f"{head}{MARK}{tail}", st.text(_BARE, min_size=3, max_size=16),
                         st.text(_BARE, min_size=3, max_size=24)).filter(lambda v: v[0] not in "-*")
_quoted_value = st.builds(lambda head, tail: f"{head}{MARK}{tail}", st.text(_QUOTED, min_size=1, max_size=16),
                          st.text(_QUOTED, min_size=1, max_size=16))
_word = st.text(string.ascii_lowercase, min_size=1, max_size=8)

_NAMES = ["api_key", "api-key", "apiKey", "hf_token", "token", "access_token", "auth_token", "secret", "password",
          "client_secret", "aws_secret_access_key", "x-api-key", "private_key", "credentials"]
_ENV_NAMES = ["HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "AWS_SECRET_ACCESS_KEY", "OPENAI_API_KEY", "VLLM_API_KEY",
              "MY_KEY", "DB_PASSWORD", "GITHUB_TOKEN", "S3_SECRET", "SERVICE_KEY_ID", "AZURE_CLIENT_SECRET",
              "API_TOKEN_VALUE"]
_FLAGS = ["--api-key", "--hf-token", "--token", "--secret", "--password"]
_SCHEMES = ["https", "http", "s3", "redis", "postgres", "git+https"]
_REFUSALS = ["invalid token", "Invalid token", "bad api key", "expired token", "revoked credentials",
             "Incorrect API key:", "invalid api_key"]


@st.composite
def _shape(draw: st.DrawFn) -> tuple[str, list[str]]:
    kind = draw(st.sampled_from(["list", "tuple", "dict", "assign", "env", "url", "auth", "refusal", "flag",
                                 "flag-many", "flag-quoted", "known"]))
    a, b = draw(secret_value), draw(secret_value)
    name = draw(st.sampled_from(_NAMES))
    quote = draw(st.sampled_from(["'", '"']))
    if kind == "list":
        values = draw(st.lists(secret_value, min_size=1, max_size=4))
        items = ", ".join(f"{quote}{v}{quote}" for v in values)
        return f"{quote}{name}{quote}: [{items}]", values
    if kind == "tuple":
        return f"{quote}{name}{quote}: ({quote}{a}{quote}, {quote}{b}{quote})", [a, b]
    if kind == "dict":
        return f"{quote}{name}{quote}: {quote}{a}{quote}", [a]
    if kind == "assign":
        sep = draw(st.sampled_from(["=", ": ", " = ", ":"]))
        return f"{name}{sep}{a}", [a]
    if kind == "env":
        env = draw(st.sampled_from(_ENV_NAMES))
        quoted = draw(st.booleans())
        return (f"{env}={quote}{a}{quote}" if quoted else f"{env}={a}"), [a]
    if kind == "url":
        scheme, host = draw(st.sampled_from(_SCHEMES)), draw(_word)
        user = draw(st.one_of(st.just(""), _word.map(lambda w: w + ":")))
        return f"{scheme}://{user}{a.replace('@', '').replace('/', '')}@{host}.example.com/{draw(_word)}", \
            [a.replace("@", "").replace("/", "")]
    if kind == "auth":
        scheme = draw(st.sampled_from(["", "Bearer ", "Basic ", "Token ", "bearer "]))
        header = draw(st.sampled_from(["Authorization: ", "authorization=", "'Authorization': '",
                                       "Proxy-Authorization: "]))
        return f"{header}{scheme}{a}" + ("'" if header.endswith("'") else ""), [a]
    if kind == "refusal":
        return f"{draw(st.sampled_from(_REFUSALS))} {a}", [a]
    flag = draw(st.sampled_from(_FLAGS))
    if kind == "flag":
        return f"{flag}{draw(st.sampled_from(['=', ' ']))}{a} --port 8000", [a]
    if kind == "flag-many":
        return f"{flag} {a} {b} --port 8000", [a, b]
    if kind == "flag-quoted":
        value = draw(_quoted_value)
        return f"{flag} {quote}{value.replace(quote, '')}{quote} --port 8000", [value.replace(quote, "")]
    token = draw(st.sampled_from(["hf_", "sk-proj-", "ghp_", "glpat-"])) + MARK + draw(
        st.text(string.ascii_letters + string.digits, min_size=40, max_size=44))
    return f"using {token} for the hub", [token]


_CARRIERS = [
    "INFO 11-27 10:00:00 [api_server.py:1] non-default args: {{'model': 'org/m', {shape}, 'port': 8000}}",
    "ValueError: could not start: {shape}",
    "RuntimeError: Engine core initialization failed. {shape}",
    "requests.exceptions.HTTPError: 401 Client Error: Unauthorized for url: {shape}",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 22.03 GiB "
    "of which 120.50 MiB is free. {shape}",
    "(EngineCore_DP0 pid=312) ERROR 11-27 10:00:01 [core.py:1] {shape}",
    "+ exec vllm serve org/m {shape}",
    "{shape}",
]


@st.composite
def secret_texts(draw: st.DrawFn) -> tuple[str, list[str]]:
    """One or two lines of failure text carrying secrets, and the secret values."""
    shape, secrets = draw(_shape())
    carrier = draw(st.sampled_from(_CARRIERS))
    text = carrier.format(shape=shape)
    if draw(st.booleans()):
        extra, more = draw(_shape())
        text += "\n" + draw(st.sampled_from(_CARRIERS)).format(shape=extra)
        secrets = [*secrets, *more]
    return text, secrets
