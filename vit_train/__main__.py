"""`python -m vit_train` (and `torchrun -m vit_train`) is `vit-train`."""

from vit_train.cli.train import train_main

if __name__ == "__main__":
    train_main()
