"""Credentials of the Chatwoot tests: the API stand-in's tokens and the webhook secret."""

API_TOKEN = "cw-api-token"
TENANT_API_TOKEN = "cw-tenant-token"
WEBHOOK_SECRET = "cw-webhook-secret"
