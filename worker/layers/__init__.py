"""Building blocks shared by the model definitions."""
