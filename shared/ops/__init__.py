"""The ops library: what a person of the business does to conversations, used by the ops page
(receiver/ops/) and by the worker's command-line tools alike: the review list, replies by
hand, pausing the bot (takeover), forgetting a person, the audit log, the live state of a
conversation, and the review webhook's event format."""
