"""The seed ConvNet of configs/mnist_o0.toml as a PyTorch module (the DDP-tutorial
model), shared by the benchmark and the parity check."""
import torch.nn as nn


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer1 = nn.Sequential(nn.Conv2d(1, 16, 5, 1, 2), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2, 2))
        self.layer2 = nn.Sequential(nn.Conv2d(16, 32, 5, 1, 2), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2, 2))
        self.fc = nn.Linear(7 * 7 * 32, 10)

    def forward(self, x):
        return self.fc(self.layer2(self.layer1(x)).reshape(x.size(0), -1))
