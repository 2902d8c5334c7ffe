"""Alert webhooks: config records, payloads, signatures, the durable outbox and per-receiver delivery."""
