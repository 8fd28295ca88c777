"""The main window: sidebar | conversation + composer, the memory dock, menus, status bar.

It wires parts together and owns no chat logic (that is ChatController) and no engine
access beyond the bridge.
"""

from __future__ import annotations

import html
import platform
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QByteArray, QSize, Qt, QUrl
from PySide6.QtGui import QDesktopServices, QGuiApplication
from PySide6.QtWidgets import (
    QApplication,
    QInputDialog,
    QLabel,
    QMainWindow,
    QMessageBox,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from engine.platform.paths import is_demo_model
from engine.protocol.events import ModelFailed, ModelLoading, ModelReady, Notice, TurnDone

from ..chat import UNDO_SECONDS, ChatController, ChatExport, ChatView, MessageListModel, RetryButton, Sidebar
from ..composer import Composer, PageBudget, PictureIntake, mime_has_pictures
from ..connection import ApiControl, EngineBridge, EngineSwitch
from ..history import History, StoredPicture
from ..icons import app_icon, icon
from ..memory import ChatMemoryMarks, MemoryDock, PictureMarkBook
from ..models import ModelPicker
from ..settings import ApiConfig, Preferences, SettingsDialog
from ..theme import apply_theme
from ..version import VERSION
from .empty_chat import GET_A_MODEL, GET_A_REAL_MODEL, HINT_DEMO, EmptyChatActions, example_picture
from .window_chrome import SpeedMeter, StatusBar, StatusLine, WindowMenus

if TYPE_CHECKING:  # open_models imports it at run time, only when the Models page is used
    from ..models import ModelsPage

HINT_NO_MODEL = "No model is loaded.\nChoose one with File ▸ Open model… (Ctrl+O), or download one with File ▸ Models…."
HINT_EMPTY = "Ask about a picture: drop it here, paste it, or attach it with the paperclip."
# On a small screen the memory dock gives way before the conversation does: the conversation keeps
# room for a ~40-character bubble beside the picture thumbnails, the sidebar for a title.
CHAT_MIN_WIDTH = 420
SIDEBAR_MIN_WIDTH = 160


class MainWindow(QMainWindow):
    def __init__(self, bridge: EngineBridge, history: History, prefs: Preferences, data_dir: Path):
        super().__init__()
        self.bridge, self.history, self.prefs, self.data_dir = bridge, history, prefs, Path(data_dir)
        self.setWindowTitle("Parley")
        self.setWindowIcon(app_icon())
        self.setStatusBar(StatusBar())  # messages cut before the engine and model labels
        # 1200 x 800, within the screen: at 1280 x 720 a taller window hid the composer below its edge
        self.resize(QSize(1200, 800).boundedTo(self.screen().availableGeometry().size()))
        self.model_ready = False
        self.model_path: str | None = None
        self.model_name = ""
        self.model_weights = ""  # the loaded model's weight format (bf16, int8, ...): the Models page sizes at it
        self.models_page: ModelsPage | None = None  # while the Models page is open
        self._closed = False

        for cid in history.purge_deleted():  # deletions from earlier sessions are final
            bridge.forget(cid)  # and the engine may drop what it kept for them
        history.purge_orphan_pictures()

        self.messages = MessageListModel(self)
        self.controller = ChatController(history, bridge, prefs, self.messages, self)
        self.intake = PictureIntake(history)
        # where each chat's KV is and which pictures are encoded, as the engine last said
        self.chat_marks = ChatMemoryMarks(self)
        self.picture_marks = PictureMarkBook(self)
        self.sidebar = Sidebar(history, self.chat_marks)
        self.chat = ChatView(self.messages)
        self.chat.delegate.picture_words = self.picture_marks.words
        self.empty_actions = EmptyChatActions(self.chat, self.open_models)
        self.empty_actions.questionChosen.connect(self.ask_example)
        self.composer = Composer(self.intake)
        self.composer.set_document_options(prefs.document_text(), prefs.frame_sampling())
        self.notice = QLabel()
        self.notice.setObjectName("chatNotice")
        self.notice.setWordWrap(True)
        self.notice.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.notice.hide()
        self.retry = RetryButton(self.controller)  # under a failed turn's message

        right = QWidget()
        rl = QVBoxLayout(right)
        rl.setContentsMargins(0, 0, 0, 0)
        rl.setSpacing(0)
        rl.addWidget(self.chat, 1)
        rl.addWidget(self.notice)
        rl.addWidget(self.retry)
        rl.addWidget(self.composer)
        right.setMinimumWidth(CHAT_MIN_WIDTH)
        self.sidebar.setMinimumWidth(SIDEBAR_MIN_WIDTH)
        self.splitter = QSplitter()
        self.splitter.addWidget(self.sidebar)
        self.splitter.addWidget(right)
        self.splitter.setStretchFactor(1, 1)
        self.splitter.setCollapsible(1, False)
        self.splitter.setSizes([260, 940])
        self.setCentralWidget(self.splitter)

        self.memory_dock = MemoryDock(self._title_for, self.chat_marks, self)
        self.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, self.memory_dock)
        self.engines = EngineSwitch(bridge, prefs.qs, self, self.memory_dock, self.data_dir)  # built-in or a server
        self.api = ApiControl(bridge.builtin, parent=self)  # serves the built-in engine, off unless Settings say so
        self.resizeDocks([self.memory_dock], [380], Qt.Orientation.Horizontal)

        self.status = StatusLine(self.statusBar(), self.engines.label)
        self.speed = SpeedMeter(self.status)
        self.chat_export = ChatExport(history, lambda text: self.statusBar().showMessage(text, 12000), self)
        self.menus = WindowMenus(self.menuBar(), self)
        self.chat.offer_varied_regenerate(prefs.sampling().greedy)
        self._wire()
        self._restore_layout()
        QGuiApplication.styleHints().colorSchemeChanged.connect(self._on_color_scheme)
        self.sidebar.refresh()
        convs = history.list_conversations()
        self.controller.open_conversation(convs[0].id if convs else None)
        self._update_hints()
        api = prefs.api_config()
        if api.enabled:
            self.apply_api(api)
        self.engines.apply()
        self.history_problem: QMessageBox | None = None
        if history.recovery is not None:  # said once the window is up; the window opens anyway
            self.history_problem = QMessageBox(
                QMessageBox.Icon.Warning,
                "Chat history was damaged",
                history.recovery.describe(),
                QMessageBox.StandardButton.Ok,
                self,
            )
            self.history_problem.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            self.history_problem.open()  # window-modal, never blocks startup

    # ------------------------------------------------------------ building

    def _wire(self) -> None:
        b, c = self.bridge, self.controller
        b.modelLoading.connect(self._on_model_loading)
        b.modelReady.connect(self._on_model_ready)
        b.modelFailed.connect(self._on_model_failed)
        b.turnStarted.connect(lambda ev: self.speed.started(ev.turn_id))
        b.tokens.connect(lambda turn_id, _cid, _text, n: self.speed.tokens(turn_id, n))
        b.turnDone.connect(self._on_turn_done)
        b.turnFailed.connect(lambda ev: self.speed.clear(ev.turn_id))
        b.engineChanged.connect(lambda _engine: self.speed.clear())
        b.memoryReport.connect(self.memory_dock.on_memory_report)
        b.encoderState.connect(self.memory_dock.on_encoder_state)
        b.spillState.connect(self.memory_dock.on_spill_state)
        b.chatMemory.connect(self.chat_marks.on_report)
        b.pictureMarks.connect(self.picture_marks.on_marks)
        b.engineChanged.connect(self._on_engine_changed)
        self.picture_marks.changed.connect(self.chat.viewport().update)
        self.picture_marks.changed.connect(self._mark_draft_pictures)
        self.composer.picturesAdded.connect(self._on_draft_pictures)
        b.notice.connect(self._on_notice)
        self.memory_dock.reportWanted.connect(b.request_memory_report)
        self.memory_dock.unloadEncoderRequested.connect(b.unload_encoder)
        self.memory_dock.spillRequested.connect(self._spill_current)
        self.api.stateChanged.connect(self.status.show_api_state)
        self.api.stateChanged.connect(self.memory_dock.on_api_state)
        self.api.activityChanged.connect(self.memory_dock.on_api_activity)

        c.conversationsChanged.connect(self.sidebar.refresh)
        c.currentChanged.connect(self._on_current_changed)
        c.generatingChanged.connect(self.composer.set_generating)
        c.problem.connect(self.show_notice)
        c.note.connect(lambda text: self.statusBar().showMessage(text, 12000))
        c.conversationsChanged.connect(self._update_title)  # a chat named after its first question
        self.retry.clicked.connect(self.notice.hide)
        self.sidebar.conversationActivated.connect(self._open)
        self.sidebar.messageActivated.connect(self._open_message)
        self.sidebar.newRequested.connect(self.new_chat)
        self.sidebar.deleteRequested.connect(c.delete_conversation)
        self.sidebar.deleteRequested.connect(self._say_deleted)
        # Ctrl+Z in the composer undoes typing first; with none left, it brings a deleted chat back
        self.composer.edit.nothingToUndo.connect(self.sidebar.undo_delete)
        self.sidebar.undoRequested.connect(c.restore_conversation)
        self.sidebar.renameRequested.connect(c.rename)
        self.sidebar.exportRequested.connect(self.chat_export.start)
        self.composer.sendRequested.connect(self._send)
        self.composer.stopRequested.connect(c.stop)
        self.chat.actionTriggered.connect(self._message_action)
        self.chat.mimeDropped.connect(lambda mime: self.composer.take_mime(mime, "dropped"))
        # a page or frame ("file#fragment") opens its document or video
        self.chat.delegate.pictureClicked.connect(
            lambda p: QDesktopServices.openUrl(QUrl.fromLocalFile(p.partition("#")[0]))
        )
        self.chat.delegate.linkClicked.connect(self._open_link)

    # ------------------------------------------------------------ model

    def load_model(self, path: str) -> None:
        self.model_path = str(path)
        self.engines.load_builtin(str(path))

    def choose_model(self) -> None:
        picker = ModelPicker(
            self.prefs.recent_models(), self.bridge.check_model_folder, current=self.model_path, parent=self
        )
        if picker.exec() and picker.chosen:
            self.load_model(picker.chosen)
        elif picker.wants_models:
            self.open_models()

    def ask_example(self, question: str) -> None:
        """An example question goes into the composer, with the example drawing if the draft has no
        picture yet; the person sends it (or edits it first)."""
        if not self.composer.attachments() and not self.composer.reading():
            self.composer.take_files([str(example_picture())])
        self.composer.set_text(question)

    def open_models(self) -> None:
        """The Models page: find, size up and download models; a finished one loads in one click."""
        from ..models import ModelsPage

        if self.models_page is not None and self.models_page.isVisible():
            self.models_page.raise_()
            return
        from engine.library.fit import running_precision

        self.models_page = page = ModelsPage(
            recent=self.prefs.recent_models(),
            parent=self,
            data_dir=self.data_dir,
            precision=running_precision(self.model_weights if self.model_ready else ""),
        )
        page.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        page.loadRequested.connect(self.load_model)
        page.destroyed.connect(lambda *_: setattr(self, "models_page", None))
        page.open()

    def _on_model_loading(self, ev: ModelLoading) -> None:
        self.model_ready = False
        self.chat_marks.clear()  # the KV and picture features of another model mean nothing to this one
        self.picture_marks.clear()
        self.status.progress.show()
        self.status.model_label.setText(f"Loading {Path(ev.path).name}…")
        self.memory_dock.on_model_loading(Path(ev.path).name)
        self.composer.set_ready(False, "The model is loading")
        self._update_hints(f"Loading {Path(ev.path).name}…")

    def _on_model_ready(self, ev: ModelReady) -> None:
        self.model_ready = True
        self.model_path, self.model_name = ev.path, ev.name
        self.model_weights = ev.weights
        self.status.progress.hide()
        self.status.model_label.setText(f"{ev.name} ({ev.family})")
        # a server's "device" is its address, which the engine label already shows
        self.status.device_label.setText(
            "" if ev.family == "remote" else " · ".join(x for x in (ev.device, ev.dtype) if x)
        )
        self.status.device_label.setVisible(bool(self.status.device_label.text()))
        self.composer.set_ready(True)
        self.composer.set_page_budget(PageBudget(ev.context_tokens, ev.page_tokens))
        self.memory_dock.on_model(ev.device, ev.name, ev.dtype if ev.family != "remote" else "")
        if ev.family != "remote":  # a server's address is not a model folder
            self.prefs.add_recent_model(ev.path)
            # the demo is remembered as "the demo", not as this install's folder (main.choose_model)
            self.prefs.set_last_model(None if is_demo_model(ev.path) else ev.path)
        self.notice.hide()
        self._update_hints()

    def _on_model_failed(self, ev: ModelFailed) -> None:
        self.model_ready = False
        self.status.progress.hide()
        self.status.model_label.setText("No model")
        self.composer.set_ready(False, "No model is loaded")
        self.show_notice(ev.message)
        self._update_hints(
            f"The model could not be loaded.\n{ev.message}\n\nChoose another with File ▸ Open model… (Ctrl+O)."
        )

    # ------------------------------------------------------------ chat

    def new_chat(self) -> None:
        self.composer.cancel_edit()  # the draft stays with the chat being left (Composer.switch_draft)
        self.controller.new_conversation()
        self.composer.edit.setFocus()

    def _open(self, conversation_id: str) -> None:
        if conversation_id != self.controller.current_id:
            self.composer.cancel_edit()
            self.controller.open_conversation(conversation_id)

    def _open_message(self, conversation_id: str, message_id: int) -> None:
        if conversation_id != self.controller.current_id:
            self.composer.cancel_edit()
        self.controller.open_message(conversation_id, message_id)

    def _send(self, text: str, refs: list) -> None:
        self.notice.hide()
        editing = self.composer.editing_message_id
        if editing is not None:  # a new version of that question; the old one keeps what followed it
            self.controller.edit_and_resend(editing, text, refs)
        else:
            self.controller.send(text, refs)
        self.composer.clear()

    def stop_or_cancel(self) -> None:
        if self.controller.is_generating():
            self.controller.stop()
        elif self.composer.editing_message_id is not None:
            self.composer.cancel_edit()

    def export_current(self) -> None:
        self.chat_export.start(self.controller.current_id)

    def delete_current(self) -> None:
        if self.controller.current_id:
            self.sidebar.delete(self.controller.current_id)

    def _say_deleted(self, _conversation_id: str) -> None:
        self.statusBar().showMessage(
            f"{self.sidebar.undo_label.text()}. Ctrl+Z or Undo (under the chats) brings it back.", UNDO_SECONDS * 1000
        )

    def edit_chat_prompt(self) -> None:
        """This conversation's own system prompt (empty: use the one from Settings)."""
        cid = self.controller.current_id
        conv = self.history.get_conversation(cid) if cid else None
        if cid is None or conv is None:
            return
        text, ok = QInputDialog.getMultiLineText(
            self,
            "Chat instructions",
            "System prompt for this chat (empty: the default from Settings):",
            conv.system_prompt or "",
        )
        if ok:
            self.history.set_system_prompt(cid, text.strip() or None)

    def _message_action(self, name: str, message_id: int) -> None:
        msg = self.controller.message(message_id)
        if msg is None:
            return
        if name == "copy":
            QGuiApplication.clipboard().setText(msg.text)
            self.statusBar().showMessage("Copied", 1500)
        elif name == "edit":
            atts = [self.intake.restore(p.ref, p.name) for p in msg.named_pictures()]
            self.composer.begin_edit(message_id, msg.text, atts)
        elif name == "regenerate":
            self.controller.regenerate(message_id)
        elif name == "varied":
            self.controller.regenerate(message_id, varied=True)
        elif name in ("older", "newer"):
            self.controller.switch_version(message_id, -1 if name == "older" else 1)

    def _open_link(self, href: str) -> None:
        url = QUrl(href)
        if url.scheme() in ("http", "https", "mailto"):  # a reply must not open local files
            QDesktopServices.openUrl(url)
        else:
            self.statusBar().showMessage(f"Not opened: {href}", 4000)

    def paste_into_composer(self) -> None:
        mime = QGuiApplication.clipboard().mimeData()
        if mime is not None and mime_has_pictures(mime):
            self.composer.take_mime(mime, "pasted")
        else:
            self.composer.edit.paste()
        self.composer.edit.setFocus()

    def _on_engine_changed(self, engine) -> None:
        """Marks speak of the built-in engine's memory: a server keeps its caches to itself."""
        builtin = engine is self.bridge.builtin
        self.chat_marks.set_active(builtin)
        self.picture_marks.set_active(builtin)
        if builtin:
            self.bridge.open_chat(self.controller.current_id)
            self._check_chat_pictures()

    def _on_current_changed(self, conversation_id: str) -> None:
        self.composer.switch_draft(conversation_id or None)
        self.sidebar.select(conversation_id or None)
        replies = [m for m in self.controller.stored_messages() if m.role == "assistant"]
        self.memory_dock.on_current_chat(conversation_id or None, replies[-1].note if replies else "")
        self.bridge.open_chat(conversation_id or None)  # on the SSD: restored before the next turn
        self._check_chat_pictures()

    def _check_chat_pictures(self) -> None:
        """Ask the engine which of the open chat's pictures are encoded and cached (after a turn
        the engine says it with the turn's end: TurnDone.pictures)."""
        self.bridge.check_pictures(self.controller.engine_pictures())

    def _on_draft_pictures(self, refs: list[str]) -> None:
        """Pictures just attached: marked cached or new; a new one starts the encoder loading now."""
        self.bridge.check_pictures([self.history.picture_ref(r) for r in refs], draft=True)

    def _mark_draft_pictures(self) -> None:
        notes = {}
        for att in self.composer.attachments():
            # a picture's mark is under its file's digest (a document's pages are marked in the chat)
            words = self.picture_marks.words(StoredPicture.parse(att.ref).digest)
            if words is not None:
                notes[att.ref] = words[1]
        self.composer.set_picture_notes(notes)
        self._update_title()
        self._update_hints()

    def _update_title(self) -> None:
        cid = self.controller.current_id
        conv = self.history.get_conversation(cid) if cid and not self._closed else None
        self.setWindowTitle(f"{conv.title} — Parley" if conv else "Parley")

    def _on_turn_done(self, ev: TurnDone) -> None:
        # its pictures' marks came with it (the bridge passed TurnDone.pictures on): nothing to ask
        self.speed.done(ev.turn_id, ev.stats)
        self.memory_dock.on_turn_stats(ev.stats, ev.conversation_id)

    def _on_notice(self, ev: Notice) -> None:
        if ev.level == "info":
            self.statusBar().showMessage(ev.message, 6000)
        else:
            self.show_notice(ev.message)

    def show_notice(self, message: str) -> None:
        self.notice.setText(message)
        self.notice.show()

    def _spill_current(self) -> None:
        if self.controller.current_id:
            self.bridge.spill_now(self.controller.current_id)

    def _title_for(self, conversation_id: str) -> str:
        conv = None if self._closed else self.history.get_conversation(conversation_id)
        return conv.title if conv else conversation_id[:8]

    def _update_hints(self, override: str | None = None) -> None:
        demo = override is None and self.model_ready and is_demo_model(self.model_path)
        if override is not None:
            self.chat.set_placeholder(override)
        elif not self.model_ready and self.model_path is None:
            self.chat.set_placeholder(HINT_NO_MODEL)
        elif self.model_ready:
            self.chat.set_placeholder(HINT_EMPTY + ("\n\n" + HINT_DEMO if demo else ""))
        no_model = not self.model_ready and self.model_path is None and override is None
        self.empty_actions.want(GET_A_REAL_MODEL if demo else (GET_A_MODEL if no_model else None), demo)

    # ------------------------------------------------------------ dialogs

    def open_settings(self) -> None:
        dlg = SettingsDialog(self.prefs, self.data_dir, self, api_apply=self.apply_api)
        if dlg.exec():
            self.apply_settings(dlg)

    def apply_settings(self, dlg: SettingsDialog) -> None:
        changes = dlg.save()
        if changes:
            self.bridge.update_settings(**changes)
        self.chat.offer_varied_regenerate(self.prefs.sampling().greedy)
        self.composer.set_document_options(self.prefs.document_text(), self.prefs.frame_sampling())
        apply_theme(_application(), self.prefs.theme())
        self.refresh_icons()
        self.apply_api(self.prefs.api_config())  # nothing to do when the dialog already applied it
        self.engines.apply()

    def apply_api(self, cfg: ApiConfig) -> str | None:
        """Start / stop / restart the API server; a failure is said in the status bar and the
        memory dock, and returned (the settings dialog shows it too). The app carries on."""
        error = self.api.apply(cfg)
        if error:
            self.statusBar().showMessage(f"API server: {error}", 15000)
        return error

    def _on_color_scheme(self, _scheme) -> None:
        if self.prefs.theme() == "system" and not self._closed:
            apply_theme(_application(), "system")
            self.refresh_icons()

    def refresh_icons(self) -> None:
        self.composer.attach.setIcon(icon("attach"))
        self.composer.set_generating(self.controller.is_generating())
        self.sidebar.new_button.setIcon(icon("new-chat"))

    def show_about(self) -> None:
        QMessageBox.about(self, "About Parley", about_text(self.data_dir))

    # ------------------------------------------------------------ layout and closing

    def _restore_layout(self) -> None:
        geo = self.prefs.qs.value("ui/geometry")
        state = self.prefs.qs.value("ui/state")
        if isinstance(geo, QByteArray):
            self.restoreGeometry(geo)
        if isinstance(state, QByteArray):
            self.restoreState(state)

    def closeEvent(self, event) -> None:
        self.prefs.qs.setValue("ui/geometry", self.saveGeometry())
        self.prefs.qs.setValue("ui/state", self.saveState())
        if not self._closed:  # the engine writes hot conversations to disk before it stops
            self.statusBar().showMessage("Saving…")
            self.statusBar().repaint()  # painted now: the event loop does not run until shutdown returns
        self.shutdown()
        super().closeEvent(event)

    def shutdown(self) -> None:
        """Save streaming replies, stop the engine, close the history. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        QGuiApplication.styleHints().colorSchemeChanged.disconnect(self._on_color_scheme)
        self.memory_dock.stop()
        self.api.stop()  # before the engine: its in-flight turns are stopped, connections closed
        self.sidebar.stop()
        self.controller.shutdown()
        self.bridge.shutdown()
        self.history.close()
        self.prefs.sync()


def about_text(data_dir: Path) -> str:
    """The version and what it runs on: what a bug report needs, copied from Help ▸ About."""
    from importlib.metadata import PackageNotFoundError, version

    def of(package: str) -> str:
        try:
            return version(package)
        except PackageNotFoundError:
            return "not installed"

    import PySide6

    runs_on = " · ".join(
        [f"PySide6 {PySide6.__version__}"] + [f"{name} {of(name)}" for name in ("torch", "transformers")]
    )
    return (
        f"<p><b>Parley {VERSION}</b></p>"
        "<p>Chat with a local vision-language model about pictures.</p>"
        f"<p>Python {platform.python_version()} · {runs_on}<br>"
        f"Data folder: {html.escape(str(data_dir))}</p>"
    )


def _application() -> QApplication:
    """The running QApplication (a window exists only inside one; instance() is typed as any core app)."""
    app = QApplication.instance()
    assert isinstance(app, QApplication), "a window runs inside a QApplication"
    return app
