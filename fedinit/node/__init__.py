"""What runs on a SuperNode's machine besides Flower: the warm ClientApp executor and the
node launcher. Not part of the FAB's apps: it is the runtime that executes them."""
