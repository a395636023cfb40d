"""Where runtime output enters the log: normalised once, so every reader agrees."""
