"""Ray Serve OpenAI-compatible application: `build_app` (deploy/app.py), its ingress and
replica deployments, protocol schemas, serve and `ray up` YAMLs. See deploy/README.md."""
