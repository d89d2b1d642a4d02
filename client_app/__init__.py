"""The ClientApp: loads its partition, restores its state, runs the method's client half."""
