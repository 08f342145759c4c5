"""Tool registries: what a model may call, its arguments' schema beside the handler.

``registry`` (a toolbox's tools, binding and running calls), ``schema`` (strict OpenAI
function schemas generated from pydantic models), ``problems`` (a validation error as one
sentence for the model) and ``fields`` (argument types the toolboxes share). The router's
and the workers' toolboxes are built on it. Imports nothing of the control plane's: any
layer may hold a toolbox.
"""
