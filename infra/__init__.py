"""What runs inside a job: the runner that wraps every tool, the example tools, container images."""
