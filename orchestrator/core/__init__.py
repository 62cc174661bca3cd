"""Values and rules every stage shares: our errors and exit codes (errors), configuration (config: Backend, Settings,
presets, TOML job files; settings_types: each field against its declared type), model profiles, the outline and
outline.md, the event values, a request's Reply, prompts and templates (prompts, resources), what the job needs
from the operating system (osutil), the job's states (states).

Nothing here imports another stage: core is the bottom layer (see docs/architecture.md, "Layers")."""
