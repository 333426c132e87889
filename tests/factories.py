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
