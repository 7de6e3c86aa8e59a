"""Example tools of the default catalog. Each reads its inputs and reports through the runner
contract (`controlplane_runner.toolkit`), so it runs the same locally and in a container."""
