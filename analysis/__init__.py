"""Pure analysis: windows to features, baselines, anomaly model, attribution, flame graphs."""
