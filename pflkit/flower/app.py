"""The Flower App entry points named in ``pyproject.toml`` (``[tool.flwr.app.components]``).

``flwr run .`` (local simulation or a remote SuperLink) loads ``server_app`` and
``client_app`` from here. The ServerApp reads the experiment from the run config
(``[tool.flwr.app.config]``, overridable with ``flwr run . --run-config "experiment='demo'
preset='smoke'"``); each SuperNode serves the partition in its node config
(``flower-supernode --insecure --superlink SERVER:8000 --port 9094 --node-config "partition-id=3
num-partitions=20 data-root='/data' state-dir='/states/3'"``; Flower >= 1.42's SuperLink serves every API on
one port: ``flower-superlink --insecure --host 0.0.0.0 --port 8000 --disable-runtime-dependency-installation``).
"""
from pflkit.flower.client_app import build_client_app
from pflkit.flower.serve import build_server_app

server_app = build_server_app()
client_app = build_client_app()
