"""Background-task requests as Open WebUI 0.12.4 and LibreChat send them, from their real
default prompts (tests/data/*.json, copied from the packages: the files name the source) and
rendered as those clients render them; and each answer parsed as that client parses it.

Open WebUI (open_webui/routers/tasks.py) sends one user message, the template with
`{{MESSAGES:END:n}}` replaced by the last n messages as "ROLE: content" lines
(utils/misc.get_messages_content), `{{prompt}}` / `{{PROMPT}}` by the last user message; with a
connection header `X-OpenWebUI-Task: {{TASK}}` it names the task (open_webui/constants.TASKS).
LibreChat (@librechat/agents createCompletionTitleRunnable) sends its completion title prompt
with `{convo}` as "User: ...\\nAI: ...".
"""
import json
import os
import re

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
with open(os.path.join(DATA, "open_webui_0.12.4_task_prompts.json"), encoding="utf-8") as f:
    OPEN_WEBUI = json.load(f)["templates"]
with open(os.path.join(DATA, "librechat_title_prompt.json"), encoding="utf-8") as f:
    LIBRECHAT = json.load(f)

# Open WebUI's task name (the X-OpenWebUI-Task value) -> its default template
OPEN_WEBUI_TASKS = {
    "title_generation": "DEFAULT_TITLE_GENERATION_PROMPT_TEMPLATE",
    "tags_generation": "DEFAULT_TAGS_GENERATION_PROMPT_TEMPLATE",
    "follow_up_generation": "DEFAULT_FOLLOW_UP_GENERATION_PROMPT_TEMPLATE",
    "query_generation": "DEFAULT_QUERY_GENERATION_PROMPT_TEMPLATE",
    "emoji_generation": "DEFAULT_EMOJI_GENERATION_PROMPT_TEMPLATE",
    "autocomplete_generation": "DEFAULT_AUTOCOMPLETE_GENERATION_PROMPT_TEMPLATE",
}


def open_webui_prompt(task, chat):
    """The user message Open WebUI sends for `task` about `chat` (a list of (role, text))."""
    template = OPEN_WEBUI[OPEN_WEBUI_TASKS[task]]
    last_user = [text for role, text in chat if role == "user"][-1]

    def messages(match):
        return "\n".join(f"{role.upper()}: {text}" for role, text in chat[-int(match[1]):])
    rendered = re.sub(r"\{\{MESSAGES:END:(\d+)\}\}", messages, template)
    for name, value in (("{{prompt}}", last_user), ("{{PROMPT}}", last_user),
                        ("{{TYPE}}", "General"), ("{{CURRENT_DATE}}", "2026-12-02")):
        rendered = rendered.replace(name, value)
    return rendered


def librechat_title_prompt(user_text, ai_text):
    convo = LIBRECHAT["convo_template"].replace("{input}", user_text).replace(
        "{output}", ai_text)
    return LIBRECHAT["completion_title_prompt"].replace("{convo}", convo)


def open_webui_parse(task, content):
    """What Open WebUI reads of a task's answer (utils/middleware.py, utils/task.py): the JSON
    object between the first '{' and the last '}' and its key; an emoji as it is."""
    if task == "emoji_generation":
        return content
    key = {"title_generation": "title", "tags_generation": "tags",
           "follow_up_generation": "follow_ups", "query_generation": "queries",
           "autocomplete_generation": "text"}[task]
    return json.loads(content[content.find("{"):content.rfind("}") + 1])[key]
