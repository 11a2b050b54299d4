"""Every service's settings: one dataclass per service, each field a flag and an environment
variable (kvledger/options.py).

They live in the shared package, not in the services, so that `kvledger serve`, the generated
docs/configuration.md and the deployment tests read every service's flags without importing a
service (and without torch, gRPC or the web framework): these modules import only the standard
library and kvledger's option machinery. The services import their settings from here.
"""
