"""Work: what each step does (executors), running one step message, persistence to the results repo,
the GPU guard, agents' health and history, statistics, intake of submissions and self-healing."""
