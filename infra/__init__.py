"""Infrastructure: configuration, the local broker, topics and broker profiles."""
