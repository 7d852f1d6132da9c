"""Dev and test only: throwaway Redis servers and the child-process lifeline (never production)."""
