"""What the modules' outputs and settings do when used as documented, beyond what a schema checks:
each is rendered from the module's own text (python-hcl2 cannot evaluate HCL, so the few
interpolations are filled with sample values) and then used the way the deploy guide says.
"""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.test_terraform import TERRAFORM, blocks

SAMPLES = {  # an interpolation's text -> what Terraform would put there
    r'join(",", var.private_subnet_ids)': "subnet-0a1,subnet-0b2",
}


def rendered_output(cloud: str, name: str) -> str:
    """A module output that is a string (or join(" ", [strings])), its interpolations filled."""
    value = blocks(TERRAFORM / "modules" / cloud, "output")[name]["value"]
    for expression, sample in SAMPLES.items():
        value = value.replace(f"${{{expression}}}", sample)
    joined = re.fullmatch(r'\$\{join\(" ", \[(.*)\]\)\}', value, re.S)
    parts = re.findall(r'"((?:[^"\\]|\\.)*)"', joined.group(1)) if joined else [value.strip('"')]
    text = " ".join(p for p in parts if p != " ")

    def fill(m: re.Match[str]) -> str:
        return "x-" + re.sub(r"\W+", "-", m.group(1)).strip("-")[-20:]
    return re.sub(r"\$\{([^{}]*(?:\{[^{}]*\}[^{}]*)*)\}", fill, text)


@pytest.mark.parametrize("cloud", ["aws", "azure", "gcp"])
def test_migrate_command_reaches_its_cli_as_written_when_run_as_documented(cloud: str) -> None:
    """`$(terraform output -raw migrate_command)`: the shell splits the words and keeps any quotes,
    so an argument quoted in the output reaches the CLI with its quotes (the AWS CLI refused the
    --network-configuration shorthand so)."""
    command = rendered_output(cloud, "migrate_command")
    argv = subprocess.run(["bash", "-c", 'printf "%s\\n" $1', "_", command], capture_output=True, text=True,
                          check=True).stdout.splitlines()
    assert not [a for a in argv if "'" in a or '"' in a], argv
    if cloud == "aws":
        value = argv[argv.index("--network-configuration") + 1]
        assert value == ("awsvpcConfiguration={subnets=[subnet-0a1,subnet-0b2],"
                         f"securityGroups=[{value.split('securityGroups=[')[1].split(']')[0]}],assignPublicIp=DISABLED}}")
