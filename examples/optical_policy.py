"""An optical policy of one's own (docs/optical.md#a-policy-of-your-own).

Use it by its path in an optical experiment file (relative to that file):

    sweep:
      policy: [ksp_ff, ../examples/optical_policy.py]

Routes with the fewest hops go first (fewer fibers to find free spectrum on); gradients
(backward transfers) ask for the most slots allowed and activations for the initial number.
What a policy may override, and what it is given, is in testbed/optical/policy.py.
"""
from testbed.optical.policy import Policy


class FewestHopsWideGradients(Policy):
    name = "fewest_hops_wide_gradients"

    def order(self, routes):
        return sorted(routes, key=lambda r: (r.hops, r.km))

    def slots(self, transfer):
        return self.bounds.high if transfer.direction == "B" else self.bounds.initial
