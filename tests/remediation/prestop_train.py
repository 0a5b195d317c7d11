"""A small torch CPU training loop under dx.watch with the pre-stop checkpoint on: trains until
killed, and on SIGUSR1 saves model and optimizer state to argv[1] at the next step."""

import sys
import time

import torch

import denpex.sdk as dx

model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
guard = dx.watch(model, optimizer, prestop_path=sys.argv[1], progress=False)
print("training", flush=True)
while True:
    x = torch.randn(32, 64)
    loss = model(x).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    guard.step(loss)
    time.sleep(0.02)
