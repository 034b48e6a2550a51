"""Deciding: the Optuna study over the cost model (search), the rule that picks N from it
(choice), recommend and predict (recommend), and the live check of a recommendation (validate)."""
