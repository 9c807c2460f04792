"""Kubernetes: ``manifest`` writes a Kubeflow Training Operator ``PyTorchJob`` or a ``JobSet`` that runs one
disttrain launcher per pod; ``env`` recognises, inside a pod, the variables those operators inject and turns
them into the launch section's nodes, node rank and rendezvous; ``yaml`` writes the manifest without a YAML
library; ``resources`` turns the memory plan into a pod's requests and its grace period."""
