"""Pure folds over session events (docs/architecture.md §1): the sidebar row, the visible
transcript with its pending turn and live scene, and the model context. Each depends on
events only; none reads storage or the clock."""
