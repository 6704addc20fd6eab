"""Small helpers every layer may use: process identity, durable and atomic writes, the workspace folder."""
