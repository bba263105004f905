"""MindSpore's quick start ("Quick Start", tutorials/beginner/quick_start) with msbridge: three added lines,
each marked ``# msbridge``.

The network, the loss, the optimizer, ``forward_fn``, ``train_step``, ``train_loop`` and ``test_loop`` are the
tutorial's. One change: the tutorial downloads MNIST; this script makes a synthetic MNIST-shaped data set
(28x28 images, 10 classes, labels a fixed function of the image) so that it runs offline, in seconds.

    .venv/bin/python examples/quickstart/quickstart.py               # 3 epochs, 1,920 training images
    .venv/bin/python examples/quickstart/quickstart.py --print-every 1 --epochs 1

The run goes to ./msbridge_runs/quickstart/ (see monitor.yaml beside this file).
"""
import argparse
import os

import mindspore
import numpy as np
from mindspore import nn
from mindspore.dataset import NumpySlicesDataset

import msbridge  # msbridge

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--samples", type=int, default=1920, help="training images (the test set is a quarter of it)")
parser.add_argument("--print-every", type=int, default=100, help="the tutorial prints the loss every 100 batches")
args = parser.parse_args()


def synthetic_mnist(samples, seed):
    """MNIST-shaped, already as the tutorial's transforms leave it: float32 (1, 28, 28), int32 labels."""
    rng = np.random.default_rng(seed)
    images = rng.normal(size=(samples, 1, 28, 28)).astype(np.float32)
    labels = (images[:, 0, :10, :].mean(axis=2).argmax(axis=1)).astype(np.int32)  # a pattern to learn
    return NumpySlicesDataset({"image": images, "label": labels}, shuffle=False)


def datapipe(dataset, batch_size):
    return dataset.batch(batch_size)


train_dataset = datapipe(synthetic_mnist(args.samples, seed=0), 64)
test_dataset = datapipe(synthetic_mnist(args.samples // 4, seed=1), 64)


# Define model
class Network(nn.Cell):
    def __init__(self):
        super().__init__()
        self.flatten = nn.Flatten()
        self.dense_relu_sequential = nn.SequentialCell(
            nn.Dense(28 * 28, 512),
            nn.ReLU(),
            nn.Dense(512, 512),
            nn.ReLU(),
            nn.Dense(512, 10)
        )

    def construct(self, x):
        x = self.flatten(x)
        logits = self.dense_relu_sequential(x)
        return logits


model = Network()

# Instantiate loss function and optimizer
loss_fn = nn.CrossEntropyLoss()
optimizer = nn.SGD(model.trainable_params(), 1e-2)


# 1. Define forward function
def forward_fn(data, label):
    logits = model(data)
    loss = loss_fn(logits, label)
    return loss, logits


# 2. Get gradient function
grad_fn = mindspore.value_and_grad(forward_fn, None, optimizer.parameters, has_aux=True)


# 3. Define function of one-step training
def train_step(data, label):
    (loss, _), grads = grad_fn(data, label)
    optimizer(grads)
    return loss


def train_loop(model, dataset):
    size = dataset.get_dataset_size()
    model.set_train()
    for batch, (data, label) in enumerate(dataset.create_tuple_iterator()):
        loss = train_step(data, label)
        run.step(loss=loss)  # msbridge

        if batch % args.print_every == 0:
            loss, current = loss.asnumpy(), batch
            print(f"loss: {loss:>7f}  [{current:>3d}/{size:>3d}]")


def test_loop(model, dataset, loss_fn):
    num_batches = dataset.get_dataset_size()
    model.set_train(False)
    total, test_loss, correct = 0, 0, 0
    for data, label in dataset.create_tuple_iterator():
        pred = model(data)
        total += len(data)
        test_loss += loss_fn(pred, label).asnumpy()
        correct += (pred.argmax(1) == label).asnumpy().sum()
    test_loss /= num_batches
    correct /= total
    print(f"Test: \n Accuracy: {(100*correct):>0.1f}%, Avg loss: {test_loss:>8f} \n")


epochs = args.epochs
monitor_yaml = os.path.join(os.path.dirname(os.path.abspath(__file__)), "monitor.yaml")
with msbridge.track(monitor_yaml, optimizer=optimizer, dataset=train_dataset, epochs=epochs) as run:  # msbridge
    for t in range(epochs):
        print(f"Epoch {t+1}\n-------------------------------")
        train_loop(model, train_dataset)
        test_loop(model, test_dataset, loss_fn)
print("Done!")
