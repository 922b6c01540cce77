"""The embedded default: the whole fleet on one machine, no AWS account needed.

Development tooling only (it needs moto); it is not shipped in the worker image or
the Lambda function.
"""
