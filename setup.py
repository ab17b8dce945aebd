"""Packaging for mortred-twisted.

The twistd plugins live in the top-level ``twisted_plugins/`` folder of the source
tree and are installed as ``twisted.plugins`` (Twisted discovers plugins only in
``twisted/plugins/`` folders on ``sys.path``). This works for a regular
(non-editable) install, which is what the Makefile does.
"""

import ast
from pathlib import Path

from setuptools import find_packages, setup


def _builtin_models() -> dict[str, str]:
    """MODEL_FACTORIES of model_api/builtins.py, read without importing the package."""
    tree = ast.parse(
        Path(__file__).with_name("mortred_twisted").joinpath("model_api", "builtins.py").read_text()
    )
    for node in ast.walk(tree):
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "MODEL_FACTORIES":
            return ast.literal_eval(node.value)
    raise RuntimeError("MODEL_FACTORIES not found in mortred_twisted/model_api/builtins.py")


setup(
    name="mortred-twisted",
    version="0.1.0",
    description="AI model server on the Twisted reactor with an exact async job API",
    python_requires=">=3.11",
    packages=find_packages(include=["mortred_twisted", "mortred_twisted.*"])
    + ["mortred_twisted.ui.static", "twisted.plugins"],
    package_dir={"twisted.plugins": "twisted_plugins"},
    package_data={
        "mortred_twisted.ui.static": ["*.html", "*.js", "*.css"],
        # the Redis job store's Lua scripts (stores/redis_scripts.py loads them)
        "mortred_twisted.stores": ["lua/*.lua"],
    },
    include_package_data=True,
    install_requires=[
        # [tls]: pyOpenSSL, service_identity, idna (rediss:// to the job store)
        "twisted[tls]>=24.7",
        "klein>=24.8",
        "werkzeug>=3,<4",
        "treq>=24.9",
        # torch is pinned so that a fresh install takes the CPU wheel on this
        # machine's disk; a range would pull a multi-GB CUDA build from PyPI.
        "torch==2.13.0",
        "numpy>=1.26",
        "pillow>=10",
        "prometheus-client>=0.20",
        # HTTP/1.1 framing (llhttp, the parser of Node.js and uvicorn): the gateway
        # decides no chunk size, Content-Length or Transfer-Encoding itself.
        "httptools==0.9.0",
        # job_store = "redis": hiredis' C command packer and reply reader (redis-py's
        # parser) under our own Twisted protocol (stores/resp.py; never blocks the
        # reactor). It replaced txredisapi 1.6, whose per-argument Python encoding and
        # Deferreds per reply halved the pipelined rate (docs/architecture.md).
        "hiredis==3.5.0",
        # The field's diffusion library: denoisers, schedulers, autoencoders.
        "diffusers==0.42.1",
        # The field's vision library: SamModel, image classifiers and object detectors
        # (issue 21). Works without torchvision (PIL image processors) and timm.
        "transformers==5.23.0",
        "safetensors>=0.4",
    ],
    extras_require={
        "test": [
            "pytest>=8",
            "pytest-twisted>=1.14",
            "hypothesis>=6.100",
            "scikit-learn>=1.4",
            "ruff>=0.6",
            # tests/deploy: Kubernetes' schemas (bundled, offline) and KEDA's CRD models
            "kubernetes-validate==1.37.0",
            "cloudcoil==0.6.0",
            "cloudcoil-models-keda==2.16.1.0",
            # the real clients of the protocol doors (tests/protocols, docs/protocols.md)
            "openai==3.63.0",
            "tritonclient[http]==2.73.0",
            "replicate==1.0.7",
            # + requirements/s3-test.txt (the S3 server of the result-file tests,
            # pinned by hash, which an extra cannot do; `make install` installs it)
        ],
        "train": ["scikit-learn>=1.4"],
    },
    entry_points={
        "console_scripts": [
            "mortredctl=mortred_twisted.cli.mortredctl:main",
        ],
        # The built-in model families, registered the way any package registers its
        # models for `[model] type = "<name>"` (mortred_twisted/sdk/loading.py); the
        # list is model_api/builtins.py's MODEL_FACTORIES (a test keeps them equal).
        "mortred_twisted.models": [
            f"{name}={target}" for name, target in _builtin_models().items()
        ],
    },
)
