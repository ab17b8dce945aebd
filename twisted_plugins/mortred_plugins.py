"""twistd plugins: mortred-model, mortred-gateway, mortred-supervisor.

Kept tiny on purpose: twistd imports every plugin file to build ``--help``, so this
file imports nothing heavy; the work lives in the ``mortred_twisted.tap`` modules.
"""

from twisted.application.service import ServiceMaker

mortredModel = ServiceMaker(
    "mortred-model",
    "mortred_twisted.tap.model_server",
    "A mortred model server (sync /infer and async /jobs).",
    "mortred-model",
)
mortredGateway = ServiceMaker(
    "mortred-gateway",
    "mortred_twisted.tap.gateway",
    "The mortred gateway: auth, routing and URL rewriting to model servers.",
    "mortred-gateway",
)
mortredSupervisor = ServiceMaker(
    "mortred-supervisor",
    "mortred_twisted.tap.supervisor",
    "The mortred supervisor: catalog, process lifecycle, status, logs, web UI.",
    "mortred-supervisor",
)
