"""The thinking policy: the rules that pick a mode per request, and where the policy document is stored."""
