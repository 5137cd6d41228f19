"""Turn text <-> token ids for multi-turn episodes, one renderer for RL rollouts and SFT data.

An episode's tokens are built piece by piece and never re-encoded:

    first_chunk(obs_0)                 prompt: system message, first observation, the opening
                                       of the assistant turn (all token type 0)
    action ids                         exactly what was sampled (or the encoded gold action)
    next_chunk(obs_1, action ids)      closes the action turn, the observation, opens the
                                       next assistant turn (type 0)
    action ids ...

"chat" takes the pieces from the tokenizer's own chat template (rendered once with
placeholder texts), so an episode equals `apply_chat_template` of the same conversation
wherever BPE merges do not cross a piece boundary (pieces meet at special tokens or
newlines). "plain" is a chat-free template for base models:

    {system}\n\n{obs_0}\n> {action_0}\n{obs_1}\n> {action_1}...
"""

from __future__ import annotations

from collections.abc import Sequence

TEMPLATES = ("chat", "plain")
DEFAULT_SYSTEM_PROMPT = ("You are an agent in a text game. Each turn you see the state; "
                         "answer with one short command.")
PLAIN_PROMPT = "\n> "
_OBS_A, _ACT, _OBS_B = "\x1eOBSA\x1e", "\x1eACT\x1e", "\x1eOBSB\x1e"


def _encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


class Renderer:
    """Builds the token chunks of an episode for one tokenizer and template.

    tokenizer: a Hugging Face tokenizer (with a chat template for "chat").
    template: "chat" | "plain". system_prompt: the first message ("" for none).
    stop_strings: an action ends at the first of these (text sent to the env is cut there).
    """

    def __init__(self, tokenizer, template: str = "chat",
                 system_prompt: str = DEFAULT_SYSTEM_PROMPT,
                 stop_strings: Sequence[str] = ("\n",)):
        if template not in TEMPLATES:
            raise ValueError(f"template {template!r}; one of {list(TEMPLATES)}")
        self.tokenizer = tokenizer
        self.template = template
        self.system_prompt = system_prompt
        self.stop_strings = tuple(stop_strings)
        self.eos_id = tokenizer.eos_token_id
        if template == "chat":
            if not getattr(tokenizer, "chat_template", None):
                raise ValueError("template='chat' needs a tokenizer with a chat_template; "
                                 "use template='plain' for this tokenizer")
            self._head, self._open, self._close = self._chat_pieces()
        else:
            self._head = f"{system_prompt}\n\n" if system_prompt else ""
            self._open, self._close = PLAIN_PROMPT, "\n"

    # -- template pieces

    def _system(self) -> list[dict]:
        return [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []

    def _render(self, messages, add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt)

    def _chat_pieces(self) -> tuple[str, str, str]:
        """(head: before the first observation, open: after an observation up to the action,
        close: after an action up to the next observation), from the tokenizer's template."""
        two_turns = self._system() + [{"role": "user", "content": _OBS_A},
                                      {"role": "assistant", "content": _ACT},
                                      {"role": "user", "content": _OBS_B}]
        text = self._render(two_turns, add_generation_prompt=True)
        try:
            head, rest = text.split(_OBS_A)
            open_, rest = rest.split(_ACT)
            close, open_again = rest.split(_OBS_B)
        except ValueError as err:
            raise ValueError("the tokenizer's chat template does not render every message "
                             "content once; use template='plain'") from err
        if open_again != open_:
            raise ValueError("the chat template opens the assistant turn differently after "
                             f"the first turn ({open_!r} vs {open_again!r})")
        return head, open_, close

    # -- chunks

    def first_chunk(self, observation: str) -> list[int]:
        """Prompt ids: system message, first observation, opening of the first action."""
        return _encode(self.tokenizer, self._head + observation + self._open)

    def next_chunk(self, observation: str, action_ids: Sequence[int]) -> list[int]:
        """Ids after an action: the end of its turn, the observation, the next opening.

        The template's turn end is kept whole, except the part the action already emitted
        (an EOS token that is the start of the chat turn end, or the plain template's
        newline).
        """
        return _encode(self.tokenizer, self._closing(action_ids) + observation + self._open)

    def _closing(self, action_ids: Sequence[int]) -> str:
        close = self._close
        if not action_ids:
            return close
        last = int(action_ids[-1])
        if self.template == "chat":
            eos_text = self.tokenizer.eos_token or ""
            if last == self.eos_id and eos_text and close.startswith(eos_text):
                return close[len(eos_text):]
            return close
        last_text = self.tokenizer.decode([last], skip_special_tokens=False)
        return "" if last_text.endswith(close) else close

    # -- actions

    def action_ids(self, action: str) -> list[int]:
        """Ids of a forced (gold) action, ended the way a sampled action stops: by EOS with
        the chat template, by the first stop string with the plain one."""
        if self.template == "chat" and self.eos_id is not None:
            return _encode(self.tokenizer, action) + [int(self.eos_id)]
        end = self.stop_strings[0] if self.stop_strings else "\n"
        return _encode(self.tokenizer, action + end)

    def action_text(self, action_ids: Sequence[int]) -> str:
        """The command sent to the env: decoded without special tokens, cut at the first stop
        string, stripped."""
        text = self.tokenizer.decode(list(action_ids), skip_special_tokens=True)
        for stop in self.stop_strings:
            if stop and stop in text:
                text = text[:text.index(stop)]
        return text.strip()

    def conversation(self, observations: Sequence[str], actions: Sequence[str]) -> list[dict]:
        """The chat messages of an episode (for comparison with `apply_chat_template`)."""
        messages = self._system()
        for obs, act in zip(observations, actions):
            messages += [{"role": "user", "content": obs}, {"role": "assistant", "content": act}]
        return messages
