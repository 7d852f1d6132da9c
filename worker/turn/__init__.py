"""One batch's turn: its life from the brain to the finish (`turn`), how it ends (`endings`),
late delivery failures run under the person's lock (`late_failures`), and the typing
indicator kept up while the AI works (`typing_indicator`)."""
