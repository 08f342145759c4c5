"""The worker's tools. They run on the ticket's device through the gateway, or on the
ticket itself (report, subscriptions, recall); authority is enforced here.

Each tool is a handler beside its pydantic argument model, from which the schema the model
is shown is generated (:mod:`controlplane.tools`): :mod:`.device` (shell, jobs, whole
files; it gathers :mod:`.files`, view/edit/create_file over :mod:`.numbered`, and
:mod:`.search`, search/glob, which share :mod:`.fileops`), :mod:`.github` (pull
requests), :mod:`.ticket` (reports, threads, recall). :mod:`.core`
holds the ticket and the workbench they run on, :mod:`.shell_syntax` what a credentialed
command may be, and :mod:`.toolbox` the worker's toolbox, which holds a call that would act
outside the device right after input without authority (:mod:`controlplane.tickets.authority`).
"""
