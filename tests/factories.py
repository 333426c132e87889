"""`module:factory` targets for the CLI tests (bad models on purpose)."""

import torch


class _Broken(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.fc(x) @ torch.ones(3, 3)  # shape mismatch


def broken():
    return _Broken(), (torch.randn(2, 8),)


def mixed_devices():
    return torch.nn.Linear(8, 8), (torch.randn(2, 8, device="meta"),)


def not_a_pair():
    return torch.nn.Linear(8, 8)


CALLS = []  # names of the factories called in this process, to show work did not start


def raising():
    CALLS.append("raising")
    raise RuntimeError("weights not found")


def needs_width(width):
    return torch.nn.Linear(width, width), (torch.randn(2, width),)


def sized(batch: int = 2, seq: int = 8, device: str = "cpu"):
    """A factory taking some of the CLI's model options (batch, seq, device; not n_layer or dtype)."""
    CALLS.append("sized")
    model = torch.nn.Linear(16, 16).to(device)
    return model, (torch.randn(batch, seq, 16, device=device, requires_grad=True),)
