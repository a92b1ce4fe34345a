<#
.SYNOPSIS
    Install se-exporter as a Windows service on an Azure VM or scale-set instance (also the Custom Script Extension).

.DESCRIPTION
    Installs Python (from the installer given, unless one is already there), creates a virtualenv in the install
    folder from the offline wheelhouse that `make windows-wheels` builds (no package index is contacted), installs
    the WinSW service wrapper with se-exporter.xml, locks the state folder down to SYSTEM, Administrators and the
    service account, opens the metrics port to the scrapers' addresses only, starts the service and waits for
    /healthz. Running it again upgrades in place: the service is stopped, reinstalled and started again; the state
    folder (spool, open lifecycles, forwarding sequence) is kept.

    Every file it needs sits beside it (the Custom Script Extension downloads its fileUris into one folder):
        install.ps1, se-exporter.xml, WinSW-x64.exe (WinSW 3), windows-wheels.zip, and a python-3.11.x-amd64.exe
        (only if Python 3.11 is not installed yet).

    Event Hubs is reached with the VM's managed identity (role Azure Event Hubs Data Sender): no key or connection
    string is taken, stored or logged by this script.

.EXAMPLE
    powershell -ExecutionPolicy Bypass -File install.ps1 -EventHubNamespace myns.servicebus.windows.net `
        -EventHubName scheduled-events -ScrapeFrom 10.0.0.0/16
#>
[CmdletBinding()]
param(
    # The wheelhouse: dist/windows-wheels.zip from `make windows-wheels`, or that folder unpacked.
    [string] $Wheels = (Join-Path $PSScriptRoot 'windows-wheels.zip'),
    # The Python installer from python.org, used only when $PythonExe does not exist yet.
    [string] $PythonInstaller = (Get-ChildItem -Path $PSScriptRoot -Filter 'python-3.11.*-amd64.exe' -ErrorAction SilentlyContinue |
        Select-Object -First 1 -ExpandProperty FullName),
    [string] $PythonExe = (Join-Path $env:ProgramFiles 'Python311\python.exe'),
    # WinSW 3 (x64), renamed to se-exporter.exe in the install folder.
    [string] $WinSW = (Join-Path $PSScriptRoot 'WinSW-x64.exe'),
    [string] $InstallDir = (Join-Path $env:ProgramFiles 'se-exporter'),
    [string] $StateDir = (Join-Path $env:ProgramData 'se-exporter'),
    [ValidateRange(1, 65535)] [int] $Port = 10169,
    # Who may scrape /metrics through Windows Firewall: addresses, subnets or keywords such as LocalSubnet.
    [string[]] $ScrapeFrom = @('LocalSubnet'),
    # Event Hubs with the managed identity (optional): namespace host, hub, and the user-assigned identity's client id.
    [string] $EventHubNamespace = '',
    [string] $EventHubName = '',
    [string] $ClientId = '',
    # OTLP/HTTP endpoint for traces (optional), e.g. http://otel-collector.internal:4318
    [string] $OtlpEndpoint = ''
)

Set-StrictMode -Version Latest
$ErrorActionPreference = 'Stop'
$ServiceName = 'se-exporter'

function Assert-Administrator {
    $principal = [Security.Principal.WindowsPrincipal][Security.Principal.WindowsIdentity]::GetCurrent()
    if (-not $principal.IsInRole([Security.Principal.WindowsBuiltInRole]::Administrator)) {
        throw 'install.ps1 must run as an administrator (the Custom Script Extension runs as SYSTEM).'
    }
}

function Invoke-Checked {
    param([string] $FilePath, [string[]] $Arguments)
    & $FilePath @Arguments
    if ($LASTEXITCODE -ne 0) { throw "$FilePath $($Arguments -join ' ') failed with exit code $LASTEXITCODE" }
}

function Install-Python {
    if (Test-Path -LiteralPath $PythonExe) { return }
    if (-not $PythonInstaller -or -not (Test-Path -LiteralPath $PythonInstaller)) {
        throw "No Python at $PythonExe and no python-3.11.*-amd64.exe installer beside install.ps1."
    }
    $target = Split-Path -Parent $PythonExe
    $process = Start-Process -FilePath $PythonInstaller -Wait -PassThru -ArgumentList @(
        '/quiet', 'InstallAllUsers=1', 'PrependPath=0', 'Include_test=0', 'Include_launcher=0', 'Shortcuts=0',
        "TargetDir=$target")
    if ($process.ExitCode -ne 0) { throw "The Python installer failed with exit code $($process.ExitCode)" }
}

function Install-Virtualenv {
    $source = $Wheels
    if (Test-Path -LiteralPath $Wheels -PathType Leaf) {
        $source = Join-Path $env:TEMP 'se-exporter-wheels'
        if (Test-Path -LiteralPath $source) { Remove-Item -LiteralPath $source -Recurse -Force }
        Expand-Archive -LiteralPath $Wheels -DestinationPath $source
        $nested = Get-ChildItem -LiteralPath $source -Directory | Select-Object -First 1
        if ($nested -and -not (Get-ChildItem -LiteralPath $source -Filter '*.whl')) { $source = $nested.FullName }
    }
    New-Item -ItemType Directory -Force -Path $InstallDir | Out-Null
    $venv = Join-Path $InstallDir 'venv'
    Invoke-Checked $PythonExe @('-m', 'venv', '--clear', $venv)
    # Offline, from the wheelhouse only: the exact versions the suite tested (requirements/runtime.txt), each wheel
    # checked against the hash its requirements.txt names, nothing fetched at install time.
    Invoke-Checked (Join-Path $venv 'Scripts\python.exe') @(
        '-m', 'pip', 'install', '--no-index', '--find-links', $source, '--disable-pip-version-check',
        '--require-hashes', '-r', (Join-Path $source 'requirements.txt'))
}

function Set-StateFolderAcl {
    New-Item -ItemType Directory -Force -Path $StateDir | Out-Null
    New-Item -ItemType Directory -Force -Path (Join-Path $StateDir 'logs') | Out-Null
    # Well-known SIDs, so the script works whatever the display language: SYSTEM, Administrators, LOCAL SERVICE.
    $system = New-Object Security.Principal.SecurityIdentifier 'S-1-5-18'
    $admins = New-Object Security.Principal.SecurityIdentifier 'S-1-5-32-544'
    $service = New-Object Security.Principal.SecurityIdentifier 'S-1-5-19'
    $inherit = [Security.AccessControl.InheritanceFlags]'ContainerInherit, ObjectInherit'
    $none = [Security.AccessControl.PropagationFlags]::None
    $allow = [Security.AccessControl.AccessControlType]::Allow
    $acl = New-Object Security.AccessControl.DirectorySecurity
    $acl.SetAccessRuleProtection($true, $false)  # no inherited entries: Users get nothing
    $acl.SetOwner($admins)
    foreach ($rule in @(
            (New-Object Security.AccessControl.FileSystemAccessRule $system, 'FullControl', $inherit, $none, $allow),
            (New-Object Security.AccessControl.FileSystemAccessRule $admins, 'FullControl', $inherit, $none, $allow),
            (New-Object Security.AccessControl.FileSystemAccessRule $service, 'Modify', $inherit, $none, $allow))) {
        $acl.AddAccessRule($rule)
    }
    Set-Acl -LiteralPath $StateDir -AclObject $acl
}

function Write-ServiceConfig {
    [xml] $config = Get-Content -Raw -LiteralPath (Join-Path $PSScriptRoot 'se-exporter.xml')
    $settings = [ordered]@{
        'SE_EXPORTER_LISTEN'              = ":$Port"
        'SE_EXPORTER_EVENTHUB_NAMESPACE'  = $EventHubNamespace
        'SE_EXPORTER_EVENTHUB_NAME'       = $EventHubName
        'SE_EXPORTER_EVENTHUB_CLIENT_ID'  = $ClientId
        'OTEL_EXPORTER_OTLP_ENDPOINT'     = $OtlpEndpoint
    }
    foreach ($name in $settings.Keys) {
        if (-not $settings[$name]) { continue }
        $element = $config.service.SelectSingleNode("env[@name='$name']")
        if (-not $element) {
            $element = $config.CreateElement('env')
            $element.SetAttribute('name', $name)
            $config.service.InsertBefore($element, $config.service.SelectSingleNode('serviceaccount')) | Out-Null
        }
        $element.SetAttribute('value', $settings[$name])
    }
    $config.service.arguments = "-m se_exporter run --state-dir `"$StateDir`""
    $config.service.workingdirectory = $StateDir
    $config.service.logpath = (Join-Path $StateDir 'logs')
    $config.Save((Join-Path $InstallDir 'se-exporter.xml'))
}

function Remove-OldService {
    # Before the virtualenv is rebuilt: its files are in use while the service runs.
    $wrapper = Join-Path $InstallDir 'se-exporter.exe'
    if (Get-Service -Name $ServiceName -ErrorAction SilentlyContinue) {
        Invoke-Checked $wrapper @('stop')  # Ctrl+C to se-exporter: the orderly stop, spool kept
        Invoke-Checked $wrapper @('uninstall')
    }
}

function Install-Service {
    $wrapper = Join-Path $InstallDir 'se-exporter.exe'
    Copy-Item -LiteralPath $WinSW -Destination $wrapper -Force
    Write-ServiceConfig
    Invoke-Checked $wrapper @('install')
    Invoke-Checked $wrapper @('start')
}

function Open-MetricsPort {
    $rule = 'se-exporter-metrics'
    Get-NetFirewallRule -Name $rule -ErrorAction SilentlyContinue | Remove-NetFirewallRule
    New-NetFirewallRule -Name $rule -DisplayName "se-exporter /metrics (TCP $Port)" -Direction Inbound -Action Allow `
        -Protocol TCP -LocalPort $Port -RemoteAddress $ScrapeFrom -Profile Any | Out-Null
}

function Wait-Healthy {
    $deadline = (Get-Date).AddSeconds(60)
    while ((Get-Date) -lt $deadline) {
        try {
            $answer = Invoke-WebRequest -UseBasicParsing -TimeoutSec 5 -Uri "http://127.0.0.1:$Port/healthz"
            if ($answer.StatusCode -eq 200) { Write-Output "se-exporter is running: http://127.0.0.1:$Port/metrics"; return }
        } catch { Start-Sleep -Seconds 1 }
    }
    throw "se-exporter did not answer /healthz within 60 s; see $(Join-Path $StateDir 'logs')"
}

Assert-Administrator
Remove-OldService
Install-Python
Install-Virtualenv
Set-StateFolderAcl
Install-Service
Open-MetricsPort
Wait-Healthy
