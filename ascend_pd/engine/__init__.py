"""What the Pulumi engine does with this program, modelled without the CLI: the resource graph the
program registers (`capture`, under the SDK's mocks) and the steps a `pulumi up` or `destroy` runs
from one graph to another (`model`)."""
