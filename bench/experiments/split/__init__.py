"""Split experiment: HTTP fronts in processes of their own, the log in another."""
