"""Notifications: webhooks announcing experiment events, from a durable outbox."""
