"""Task pieces shared by every strategy: models, datasets, partitions and noise."""
