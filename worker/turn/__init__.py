"""One batch's turn: its life from the brain to the finish, read in order (`turn`), the writes
it makes under its lease (`under_lease`), the parts it sends (`sending`), how it ends when not
done (`endings`), late delivery failures run under the person's lock (`late_failures`), and the
typing indicator kept up while the AI works (`typing_indicator`). The turn uses the others;
none of them uses the turn."""
