"""The chat app: the conversation on screen, its engine `Session`, and the workers that feed it.

A reply is generated in a worker thread that does nothing but drain the engine's token stream.
The UI reads the reply's text and the engine's own counters on a timer, REFRESH_HZ times a
second, so the UI costs the same at 5 tok/s as at 5,000, and a busy UI never slows the model.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.widgets import Footer
from textual.worker import Worker

from engine.api import context_cap_note, drafts_note, load, open_session
from engine.backends import resolve_device, resolve_drafts
from engine.errors import KogError
from engine.registry import ModelSpec, Registry, installed
from engine.sampling import SamplingParams
from engine.session import Generation, GenerationStats, Session
from tui import clipboard, commands
from tui.export import to_markdown, write_new
from tui.screens.chats import ChatList
from tui.screens.code import CodeView
from tui.screens.confirm import Confirm
from tui.screens.models import ModelPicker, size_text
from tui.screens.pull import PullModel
from tui.store import ChatStore, Conversation
from tui.widgets.conversation import ConversationView, ReplyView, printable
from tui.widgets.prompt import PromptInput
from tui.widgets.status import StatusBar, StatusInfo

REFRESH_HZ = 20
STOP_NOTES = {"cancelled": "stopped", "length": "reached the reply limit", "context": "the context is full"}


@dataclass(frozen=True)
class ChatOptions:
    model: str | None = None  # registry name, hf:ORG/REPO or path; None: the registry's default
    device: str = "auto"
    context: int | None = None
    system: str | None = None
    temperature: float = 0.0
    seed: int = 0
    max_tokens: int = 2048
    resume: int | None = None  # a saved chat's id
    drafts: int | None = None  # positions a greedy pass checks; None: the engine's default for the device and sampling


# How the app gets a Session for a model: (target, device, context, system, drafts) -> Session.
SessionOpener = Callable[[str | None, str, int | None, str | None, int], Session]


def engine_session(target: str | None, device: str, context: int | None, system: str | None, drafts: int) -> Session:
    # progress=False: pull progress printed to the terminal would tear the screen; the app pulls
    # missing models itself, with its own bar, before it gets here.
    return open_session(load(target, progress=False), device=device, context=context, system=system,
                        draft_positions=drafts)


def missing_model(target: str | None) -> ModelSpec | None:
    """The registry model `target` names if it still has to be downloaded."""
    try:
        registry = Registry()
        spec = registry.resolve(target).spec
    except KogError:
        return None  # loading reports the problem
    return spec if spec is not None and not installed(spec) else None


class ModelReady(Message):
    def __init__(self, seq: int, session: Session | None, error: str | None, drafts: int = 1):
        super().__init__()
        self.seq, self.session, self.error = seq, session, error
        self.drafts = drafts  # the positions a pass asked of the engine


class ReplyDone(Message):
    def __init__(self, generation: Generation, error: str | None):
        super().__init__()
        self.generation, self.error = generation, error


class ChatApp(App):
    TITLE = "kog chat"
    ENABLE_COMMAND_PALETTE = False
    CSS = """
    Screen { layout: vertical; }
    """
    BINDINGS = [
        # priority: the message box would take Esc and Ctrl+C for itself; check_action lets them
        # through when there is no reply to stop.
        Binding("escape", "stop", "Stop", priority=True),
        Binding("ctrl+c", "stop", "Stop", show=False, priority=True),
        Binding("ctrl+n", "new_chat", "New"),
        Binding("ctrl+o", "chats", "Chats"),
        Binding("ctrl+t", "models", "Models"),
        Binding("ctrl+b", "copy_code", "Copy code"),
        Binding("ctrl+q", "quit", "Quit", priority=True),
    ]

    def __init__(self, options: ChatOptions, store: ChatStore, session_opener: SessionOpener = engine_session):
        super().__init__()
        self.options = options
        self.store = store
        self.open_session = session_opener
        self.params = SamplingParams(temperature=options.temperature, seed=options.seed)
        self.system = options.system
        self.session: Session | None = None
        self.messages: list[dict] = []  # the conversation; the session gets a copy before each turn
        self.chat_id: int | None = None  # created in the store with the first message
        self.generation: Generation | None = None
        self.loading: str | None = None  # the model being loaded
        self._load_seq = 0  # only the latest load's result counts
        self._reply: ReplyView | None = None
        self._stop = threading.Event()
        self._generate_worker: Worker | None = None
        self._last_stats: GenerationStats | None = None
        self._context_used = 0  # the conversation's tokens, as the status bar shows them between replies
        self.startup_error: str | None = None  # why the model named on the command line did not load (the app exits)
        self._startup_load: int | None = None  # the load of that model, once started

    def compose(self) -> ComposeResult:
        # Kept as attributes: a query from the app searches whichever screen is on top.
        self.conversation = ConversationView()
        self.prompt = PromptInput()
        self.status = StatusBar()
        yield self.conversation
        yield self.prompt
        yield self.status
        yield Footer()

    async def on_mount(self) -> None:
        self.prompt.focus()
        if self.store.notice:
            await self.conversation.add_error(self.store.notice)
        target = self.options.model
        chat = await self._open_chat(self.options.resume) if self.options.resume is not None else None
        if chat is not None:
            target = target or chat.model
            if self.options.system is not None:  # given on the command line: it wins over the saved one
                await self._command_system(self.options.system)
        self.set_interval(1 / REFRESH_HZ, self._refresh)
        self.use_model(target)
        if self.options.model is not None and self.loading is not None:  # (a download first: no load yet, no exit)
            self._startup_load = self._load_seq

    # --- models -------------------------------------------------------------------------

    def use_model(self, target: str | None) -> None:
        """Switch to `target`, downloading it first (with a bar) when it is a registry model not yet here."""
        spec = missing_model(target)
        if spec is None:
            self._start_load(target)
            return

        async def pulled(result: Path | str) -> None:
            if isinstance(result, Path):
                self._start_load(target)
            else:
                await self.conversation.add_error(result)

        if spec.default:  # like `kog generate`, the default model is fetched without asking
            self.push_screen(PullModel(spec), pulled)
        else:
            question = f"{spec.name} is not installed. Download it now ({size_text(spec.size)})?"
            self.push_screen(Confirm(question), lambda yes: self.push_screen(PullModel(spec), pulled) if yes else None)

    def _start_load(self, target: str | None) -> None:
        self._load_seq += 1
        self.loading = target or "the default model"
        self._load(target, self._load_seq)

    @work(thread=True, group="model")
    def _load(self, target: str | None, seq: int) -> None:
        try:
            device = resolve_device(self.options.device)
            # (the drafts' build is made at load: a chat started sampling and turned greedy decodes plainly)
            drafts = resolve_drafts(self.options.drafts, device, self.params)
            session = self.open_session(target, device, self.options.context, self.system, drafts)
        except KogError as e:
            self.post_message(ModelReady(seq, None, str(e)))
        except Exception as e:  # a broken model file must not take the app down
            self.post_message(ModelReady(seq, None, f"could not load {self.loading}: {type(e).__name__}: {e}"))
        else:
            self.post_message(ModelReady(seq, session, None, drafts))

    async def on_model_ready(self, event: ModelReady) -> None:
        if event.seq != self._load_seq:
            if event.session is not None:
                event.session.backend.close()
            return
        self.loading = None
        if event.error is not None:
            if event.seq == self._startup_load:  # `--model` named one that cannot load: say so and end
                self.startup_error = event.error
                self.exit(return_code=1)
                return
            await self.conversation.add_error(event.error)
            return
        if self.session is not None:
            self.session.backend.close()
        self.session, self._last_stats = event.session, None  # the last model's rates are not this one's
        self._context_used = self._conversation_tokens()
        name = self.session.model.name
        for note in (context_cap_note(name, self.options.context, self.session.context_size),
                     drafts_note(name, event.drafts, self.session.backend.pass_positions)):
            if note:
                self.notify(note, severity="warning", markup=False)
        if self.chat_id is not None:
            await self._save(lambda: self.store.update(self.chat_id, model=self.session.model.target))

    # --- sending and streaming ----------------------------------------------------------

    async def on_prompt_input_submitted(self, event: PromptInput.Submitted) -> None:
        text = event.text.strip()
        if not text:
            return
        try:
            command = commands.parse(text)
        except KogError as e:
            await self.conversation.add_error(str(e))
            return
        if command is not None:
            self.prompt.clear()
            await self.run_command(command)
        else:
            await self.send(commands.message_text(text))

    async def send(self, text: str) -> None:
        if self.generation is not None:
            self.notify("a reply is still coming: wait, or stop it with Esc", severity="warning")
            return
        if self.loading or self.session is None:
            # while another model loads, the reply would come from the one about to be closed
            why = f"the model is still loading ({self.loading})" if self.loading else "no model is loaded: /model NAME"
            self.notify(why, severity="warning", markup=False)
            return
        self.session.system = self.system
        self.session.set_messages(self.messages)
        try:
            generation = self.session.send(text, self.params, self.options.max_tokens)
        except KogError as e:  # e.g. longer than the context; the text stays in the box
            await self.conversation.add_error(str(e))
            return
        self.prompt.clear()
        self.messages.append({"role": "user", "content": text})
        await self.conversation.add_message("user", text)
        await self._save_message("user", text)
        self.generation = generation
        self._reply = await self.conversation.start_reply()
        self._stop = threading.Event()
        self._generate_worker = self._generate(generation, self._stop)

    @work(thread=True, group="generate")
    def _generate(self, generation: Generation, stop: threading.Event) -> str | None:
        """Drain the token stream; the UI reads generation.text and .stats on its own clock."""
        events = iter(generation)
        error = None
        try:
            for _ in events:
                if stop.is_set():  # a cancel during prefill is only seen at the first token
                    break
        except KogError as e:
            error = str(e)
        except Exception as e:  # an engine failure ends this reply, not the app
            error = f"the engine failed: {type(e).__name__}: {e}"
        finally:
            events.close()  # runs the stream's cleanup now: the session records what was cached
        self.post_message(ReplyDone(generation, error))
        return error

    async def _refresh(self) -> None:
        generation, reply = self.generation, self._reply
        if generation is not None and reply is not None:
            text = generation.text  # only ever grows while the stream runs
            if len(text) > len(reply.text):
                await reply.show(text)
        self.status.show(self._status())

    async def on_reply_done(self, event: ReplyDone) -> None:
        await self._finish_reply(event.generation, event.error)

    async def _finish_reply(self, generation: Generation, error: str | None) -> None:
        if self.generation is not generation:
            return  # already finished (on quit)
        self.generation, reply, self._reply = None, self._reply, None
        self._last_stats = generation.stats
        text, reason = generation.text, generation.stats.stop_reason
        self.messages = list(self.session.messages)  # the session added the reply, partial or whole
        if text:
            await reply.finish(text, STOP_NOTES.get(reason, ""))
            model = self.session.model
            await self._save_message("assistant", text, generation.stats.as_dict() | {"model": model.name})
            await self._save(lambda: self.store.update(self.chat_id, model=model.target))  # what --resume loads
        else:
            await reply.remove()
            self.messages = self.messages[:-1]  # nothing was said; keep no empty turn
        self._context_used = self._conversation_tokens()  # (the cache holds less after a stop inside the prefill)
        if error is not None:
            await self.conversation.add_error(error)
        self.status.show(self._status())

    def _status(self) -> StatusInfo:
        session, generation = self.session, self.generation
        if generation is not None:
            stats = generation.stats
            state = "generating" if stats.generated_tokens else "prefill"
            used = stats.prompt_tokens + stats.generated_tokens
        else:
            stats = self._last_stats
            state = f"loading {self.loading}…" if self.loading else "ready" if session else "no model"
            used = self._context_used
        info = StatusInfo(state, model=self.loading or "")
        if session is not None:
            info = replace(info, model=session.model.name, backend=session.backend.name,
                           device=session.backend.device_name, context_tokens=used, context_size=session.context_size)
        if stats is not None:
            info = replace(info, decode_tok_s=stats.decode_tok_s, ttft_s=stats.ttft_s,
                           prefill_tok_s=stats.prefill_tok_s, reused_tokens=stats.reused_tokens)
        return info

    def check_action(self, action: str, parameters: tuple) -> bool | None:
        if action == "stop":
            # only on the chat itself: in a dialog, Esc closes the dialog
            return self.generation is not None and len(self.screen_stack) == 1
        return True

    def action_stop(self) -> None:
        if self.generation is not None:
            self._stop.set()
            self.generation.cancel()

    async def action_quit(self) -> None:
        for screen in self.screen_stack:  # a download in the app would hold the exit until it ends
            if isinstance(screen, PullModel):
                screen.stop()
        generation = self.generation
        if generation is not None:  # keep the partial reply, as Esc would
            self.action_stop()
            error = await self._generate_worker.wait()
            await self._finish_reply(generation, error)
        self.exit()

    def _conversation_tokens(self) -> int:
        """What the conversation shown takes of the context: counted when it changes, not per refresh."""
        if self.session is None or not self.messages:
            return 0
        head = [{"role": "system", "content": self.system}] if self.system else []
        try:
            return len(self.session.model.tokenizer.encode_chat(head + self.messages, add_generation_prompt=False))
        except KogError:  # a template that will not render this history: the next send says so
            return 0

    # --- persistence --------------------------------------------------------------------

    async def _save(self, write: Callable[[], object]) -> None:
        """Run one store write; a failure is shown, and the chat goes on in memory."""
        try:
            write()
        except KogError as e:
            await self.conversation.add_error(str(e))

    async def _save_message(self, role: str, text: str, stats: dict | None = None) -> None:
        def write() -> None:
            if self.chat_id is None:
                self.chat_id = self.store.create(self.session.model.target, self.system)
            self.store.add_message(self.chat_id, role, text, stats)

        await self._save(write)

    async def _open_chat(self, chat_id: int) -> Conversation | None:
        try:
            chat = self.store.get(chat_id)
            stored = self.store.messages(chat_id)
        except KogError as e:
            await self.conversation.add_error(str(e))
            return None
        await self.conversation.clear()
        for message in stored:
            await self.conversation.add_message(message.role, message.content,
                                                STOP_NOTES.get((message.stats or {}).get("stop_reason"), ""))
        self.chat_id, self.system = chat.id, chat.system
        self.messages = [{"role": m.role, "content": m.content} for m in stored]
        self._last_stats, self._context_used = None, self._conversation_tokens()
        return chat

    # --- commands -----------------------------------------------------------------------

    async def run_command(self, command: commands.Command) -> None:
        busy = command.name in ("new", "chats", "model", "clear") and self.generation is not None
        if busy:
            await self.conversation.add_error(f"/{command.name} has to wait for the reply: stop it with Esc")
            return
        try:
            await getattr(self, f"_command_{command.name}")(command.arg)
        except KogError as e:
            await self.conversation.add_error(str(e))

    async def _command_new(self, arg: str) -> None:
        await self.conversation.clear()
        self.messages, self.chat_id, self._last_stats, self._context_used = [], None, None, 0
        self.system = self.options.system

    async def _command_chats(self, arg: str) -> None:
        async def chosen(chat_id: int | None) -> None:
            if chat_id is not None and self.generation is None:
                await self._open_chat(chat_id)

        self.push_screen(ChatList(self.store.conversations()), chosen)

    async def _command_model(self, arg: str) -> None:
        if arg:
            self.use_model(arg)
            return
        # the target, not the name: a local file named like a registry model is not that model
        current = self.session.model.target if self.session else None

        def chosen(name: str | None) -> None:
            if name and self.loading is None and self.session is not None and name == self.session.model.target:
                # a reload would only drop the cache and the rates
                self.notify(f"{name} is already in use", markup=False)
            elif name:
                self.use_model(name)

        self.push_screen(ModelPicker(current), chosen)

    async def _command_system(self, arg: str) -> None:
        self.system = arg or None
        self._context_used = self._conversation_tokens()
        if self.chat_id is not None:
            await self._save(lambda: self.store.update(self.chat_id, system=arg))
        self.notify(f"system message: {printable(arg)}" if arg else "system message cleared", markup=False)

    async def _command_temp(self, arg: str) -> None:
        self.params = replace(self.params, temperature=commands.temperature(arg))
        self.notify(f"temperature {self.params.temperature:g}")

    async def _command_clear(self, arg: str) -> None:
        if not self.messages:
            raise KogError("nothing to clear")

        async def answered(yes: bool) -> None:
            if yes and self.generation is None:
                await self.conversation.clear()
                self.messages, self._last_stats, self._context_used = [], None, 0
                if self.chat_id is not None:
                    await self._save(lambda: self.store.clear(self.chat_id))

        saved = " (deleted from the saved chat too)" if self.chat_id is not None else ""
        self.push_screen(Confirm(f"Forget this chat's {len(self.messages)} messages{saved}?"), answered)

    async def _command_export(self, arg: str) -> None:
        if not self.messages:
            raise KogError("nothing to export yet")
        title = self.store.get(self.chat_id).title if self.chat_id is not None else ""
        model = self.session.model.name if self.session else ""
        path = write_new(Path(arg), to_markdown(title, model, self.system, self.messages))
        self.notify(f"exported to {printable(str(path))}", markup=False)

    async def _command_copy(self, arg: str) -> None:
        self.action_copy_code()

    async def _command_help(self, arg: str) -> None:
        await self.conversation.add_notice(commands.help_markdown())

    # --- key actions --------------------------------------------------------------------

    async def action_new_chat(self) -> None:
        await self.run_command(commands.Command("new", ""))

    async def action_chats(self) -> None:
        await self.run_command(commands.Command("chats", ""))

    async def action_models(self) -> None:
        await self.run_command(commands.Command("model", ""))

    def action_copy_code(self) -> None:
        reply = next((m["content"] for m in reversed(self.messages) if m["role"] == "assistant"), "")
        code = clipboard.last_code_block(reply)
        if code is None:
            self.notify("the last reply has no code block", severity="warning")
            return
        tool = clipboard.copy(code)
        if tool is not None:
            self.notify(f"copied the code block ({len(code.splitlines())} lines) with {tool}")
            return
        # OSC 52 reaches many terminals (over SSH too) but cannot be confirmed, so show the code as well.
        self.copy_to_clipboard(code)
        self.push_screen(CodeView(code, "No system clipboard found: the code was sent to the terminal's clipboard "
                                        "(OSC 52), which not every terminal accepts. Here it is to select:"))
